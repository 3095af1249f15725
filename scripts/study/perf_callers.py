"""The --callers tables of scripts/study/server-profile.py: from a perf recording with DWARF call
graphs, which of the server's functions the time outside it (the CUDA driver, the kernel, libc)
belongs to, and what each evr function costs its thread, callees included."""
import os
import re
import subprocess


def short_dso(dso):
    name = os.path.basename(dso.strip("()"))
    if name.startswith("[kernel"):
        return "kernel"
    return re.sub(r"\.so[.0-9]*$", "", name) or "?"


def call_chains(perf, data, comms):
    """The samples of `comms` as call chains, innermost first: [[(symbol, library)]]. perf names
    a frame it found inlined "(inlined)" instead of its library (in libc at times without the
    real frame around it)."""
    cmd = perf[0] + ["script", "-i", data, "--comms", ",".join(comms), "-F", "comm,ip,sym,dso"]
    out = subprocess.run(cmd, env=perf[1], capture_output=True, text=True).stdout
    chains, frames = [], []
    for line in out.splitlines():
        if not line.strip():
            if frames:
                chains.append(frames)
            frames = []
            continue
        m = re.match(r"^\s+[0-9a-f]+\s+(.*?)\s+\((\S+)\)\s*$", line)
        if m and line[0] in " \t":
            frames.append((re.sub(r"\+0x[0-9a-f]+$", "", m.group(1)), m.group(2)))
    if frames:
        chains.append(frames)
    return chains


def cudart_internal(symbol):
    return symbol.startswith("libcudart_static_")  # the static CUDA runtime's hidden functions


def calling_out(chain, binary):
    """(who called out, where the time went) for a sample outside `binary`, else None. Who: the
    innermost frame of `binary` that is not the CUDA runtime's own, with the runtime's entry point
    it called ("evr::...::query > cudaEventQuery")."""
    mine = os.path.basename(binary)
    leaf = next((short_dso(dso) for _, dso in chain if dso != "inlined"), "?")
    if leaf == short_dso(mine):
        return None
    api, caller = None, None
    for symbol, dso in chain:
        if os.path.basename(dso) != mine or cudart_internal(symbol):
            continue
        if symbol.startswith("cu") and api is None:
            api = symbol
            continue
        caller = symbol
        break
    who = caller or "(no frame of the server: a thread of its own, or unwinding stopped)"
    return (f"{who} > {api}" if api else who), leaf


def untemplated(symbol):
    """`symbol` without its template arguments (Asio's handler types run to kilobytes)."""
    out, depth = [], 0
    for i, ch in enumerate(symbol):
        literal = symbol[:i].endswith(("operator", "operator<", "operator-"))  # <, <<, ->
        depth += ch == "<" and not literal
        if depth == 0:
            out.append(ch)
        depth -= ch == ">" and depth > 0 and not literal
    return "".join(out)


NO_EVR = "(no evr function: the server's own code, Asio and the kernel under it)"


def innermost_evr(chain, binary, callee=False):
    """The innermost evr function on the stack and the evr function that called it ("inner <
    caller"), unless the server's own code (a frame of `binary` that is neither evr, Asio, the
    standard library nor the CUDA runtime, or Asio starting an operation) is nearer: evr's
    inclusive share, with the handlers evr runs charged to the server, not to evr's operation.
    With `callee`: "inner > the frame it called" instead ("(self)" when the sample is in the evr
    function itself), which splits an evr function's share between its own code and what it
    calls (Asio's, the driver's)."""
    mine = os.path.basename(binary)
    transparent = ("asio::", "std::", "cu", "libcudart_static_", "operator", "__", "void ")
    found = []
    for i, (symbol, dso) in enumerate(chain):
        if symbol.startswith("evr::"):
            name = re.sub(r"^evr::(detail::|device::\(anonymous namespace\)::)?", "", symbol)
            if callee:
                inner = chain[i - 1] if i > 0 else None
                inner = f"{untemplated(inner[0])} [{short_dso(inner[1])}]" if inner else "(self)"
                return f"{untemplated(name)} > {inner}"
            if not found or found[-1] != name:
                found.append(name)
            if len(found) == 2:
                break
            continue
        # (An operation's start may be a frame perf found inlined: any library.)
        if starts_an_operation(symbol) or (os.path.basename(dso) == mine
                                           and not symbol.startswith(transparent)):
            break
    if found:
        return " < ".join(found)
    return NO_EVR


def starts_an_operation(symbol):
    """Asio's start of an asynchronous operation (async_result<...>::initiate). Under a handler
    evr calls, it is the resumed coroutine's next operation (the server's next read, inlined into
    the handler's frame): the server's, though no frame of the server's own is on the stack."""
    return symbol.startswith("asio::async_result<") and "::initiate" in untemplated(symbol)


def caller_tables(perf, data, binary, requests, cpu_s, comms, lines=25):
    """Two tables over the samples of `comms` (rows {key, samples, percent, us_per_request};
    percent of all their samples): `calling_out`, the time outside the server by who called out;
    `evr`, every sample by the innermost evr function on its stack (evr's inclusive share);
    `evr_callees`, evr's share by the innermost evr function and the frame it called."""
    chains = call_chains(perf, data, comms)
    out_counts, evr_counts, callee_counts = {}, {}, {}
    for chain in chains:
        key = calling_out(chain, binary)
        if key:
            out_counts[key] = out_counts.get(key, 0) + 1
        key = innermost_evr(chain, binary)
        evr_counts[key] = evr_counts.get(key, 0) + 1
        key = innermost_evr(chain, binary, callee=True)
        if key != NO_EVR:
            callee_counts[key] = callee_counts.get(key, 0) + 1

    def rows(counts):
        total = len(chains)
        return [{"key": key, "samples": n, "percent": 100.0 * n / total,
                 "us_per_request": n / total * cpu_s / requests * 1e6 if requests else None}
                for key, n in sorted(counts.items(), key=lambda kv: -kv[1])[:lines]]

    return {"calling_out": rows(out_counts), "evr": rows(evr_counts),
            "evr_callees": rows(callee_counts)}
