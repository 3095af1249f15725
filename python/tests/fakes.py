"""Objects that implement each accepted stream/event protocol on simulated-device handles, as
torch, CuPy and the CUDA stream protocol (cuda.core) do on real ones."""


class ProtocolStream:
    """The CUDA stream protocol: __cuda_stream__() -> (version, handle)."""

    def __init__(self, handle):
        self._h = handle

    def __cuda_stream__(self):
        return (0, self._h)


class TorchLikeStream:
    """torch.cuda.Stream: .cuda_stream is the cudaStream_t as an int."""

    def __init__(self, handle):
        self.cuda_stream = handle


class TorchLikeEvent:
    """torch.cuda.Event: .cuda_event is the cudaEvent_t as an int (0 before the first record)."""

    def __init__(self, handle):
        self.cuda_event = handle


class CupyLikeStream:
    """cupy.cuda.Stream: .ptr, and stream methods such as wait_event."""

    def __init__(self, handle):
        self.ptr = handle

    def wait_event(self, event):  # pragma: no cover - only its presence matters
        raise NotImplementedError


class CupyLikeEvent:
    """cupy.cuda.Event: .ptr, a class named ...Event, no wait_event."""

    def __init__(self, handle):
        self.ptr = handle
