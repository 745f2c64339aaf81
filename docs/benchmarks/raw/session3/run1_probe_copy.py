"""Probe (session 3): host copy into fresh bytes, joined vs parallel torch copy, with freed-memory reuse."""

import ctypes, time, warnings, torch
from service.process.host_memory import reuse_freed_host_memory

reuse_freed_host_memory(1 << 30)
new = ctypes.pythonapi.PyBytes_FromStringAndSize
new.restype, new.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_ssize_t)
print("threads", torch.get_num_threads())
gpu = torch.randn(4 * 361, 7168, device="cuda").to(torch.bfloat16)
host = torch.empty(gpu.nbytes, dtype=torch.uint8, pin_memory=True)
n = gpu.nbytes
src = host
mv = memoryview(src.numpy())
CH = 4 << 20


def join():
    return [b"".join((b"hdr", mv[o : o + CH])) for o in range(0, n, CH)]


def par():
    out = []
    for o in range(0, n, CH):
        piece = src[o : o + CH]
        b = new(None, piece.numel() + 3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = torch.frombuffer(b, dtype=torch.uint8)
        t[3:].copy_(piece)
        out.append(b)
    return out


def d2h():
    host.copy_(gpu.view(-1).view(torch.uint8), non_blocking=True)
    torch.cuda.synchronize()


for threads in (torch.get_num_threads(), 8, 4):
    torch.set_num_threads(threads)
    for f in (d2h, join, par):
        ts = []
        for _ in range(30):
            t0 = time.perf_counter()
            x = f()
            ts.append(time.perf_counter() - t0)
            del x
        ts.sort()
        print(threads, f.__name__, f"{ts[15] * 1e3:.3f} ms {n / ts[15] / 1e9:.1f} GB/s")
