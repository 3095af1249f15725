"""A first asyncio program with evr: a coroutine queues GPU work and awaits it without blocking
the event loop. On torch's GPU stream when torch and a GPU are there, else on evr's simulated
device. The README's Python section shows this file."""
import asyncio

import evr


async def main():
    if evr.cuda_available():
        import torch

        stream = torch.cuda.current_stream()
        x = torch.ones(1 << 24, device="cuda")

        def launch():
            x.mul_(1.0001)  # your model's forward pass goes here
    else:
        dev = evr.sim.Device()  # evr's simulated GPU: tests, CI, machines without a GPU
        stream = dev.stream()

        def launch():
            dev.launch_kernel(stream, 0.002)  # a kernel of 2 ms

    print("running on", "the GPU" if evr.cuda_available() else "the simulated device")
    for request in range(1, 4):
        launch()
        await evr.wait(stream)  # the loop serves other tasks meanwhile
        print(f"request {request}: GPU work done")


asyncio.run(main())
