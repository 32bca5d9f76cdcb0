#!/usr/bin/env python3
"""test_import_order.py - `import moex` before `import torch` leaves torch working (issue 30,
item 2): libmoex links no NCCL and no MPI, so loading it never puts a second libnccl.so.2 (or a
libmpi) into the process ahead of torch's. moex's EP transports open the process's own
library when an EP context is made (src/cpu/ep_mpi_lib.c, src/cuda/ep_nccl_lib.c).

As a pytest file (tests/python, against the installed package):
  - in a fresh interpreter, `import moex` loads no libnccl / libmpi (/proc/self/maps), then
    `import torch` and `import moex.torch` work and a small moex.torch.GroupedLinear forward +
    backward on the CPU matches a plain PyTorch loop;
  - the libmoex that `import moex` loads has no DT_NEEDED entry on libnccl or libmpi and no
    undefined MPI or NCCL symbol (readelf where it exists, and this file's own ELF reader,
    which must agree with it).

As a script (CTest's test_transports_unlinked, on the build tree's library):
    python3 tests/python/test_import_order.py LIBMOEX_SO [...]
exits 1 naming every offending NEEDED entry or symbol, 0 when there is none.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys

# a NEEDED entry that loads a communication library torch (NCCL) or the caller (MPI) owns
FORBIDDEN_NEEDED = re.compile(r"^lib(nccl|mpi|mpich|open-pal|open-rte|pmix)\b", re.I)
# an undefined dynamic symbol that only such a library defines (Open MPI's predefined handles
# are global objects, ompi_mpi_byte ...; its functions MPI_*, profiling PMPI_*)
FORBIDDEN_SYMBOL = re.compile(r"^(P?MPIX?_|ompi_|opal_|p?nccl[A-Z])")


# ---- the ELF dynamic section and dynamic symbols, read directly ------------------------------

def _elf_sections(data):
    """(fmt prefix, 64-bit?, [(sh_type, sh_link, sh_offset, sh_size, sh_entsize)])."""
    if data[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    is64 = data[4] == 2
    end = "<" if data[5] == 1 else ">"
    if is64:
        shoff, = struct.unpack_from(end + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(end + "HH", data, 0x3A)
        shdr = end + "IIQQQQIIQQ"
    else:
        shoff, = struct.unpack_from(end + "I", data, 0x20)
        shentsize, shnum = struct.unpack_from(end + "HH", data, 0x2E)
        shdr = end + "IIIIIIIIII"
    secs = []
    for i in range(shnum):
        f = struct.unpack_from(shdr, data, shoff + i * shentsize)
        # name, type, flags, addr, offset, size, link, info, addralign, entsize
        secs.append((f[1], f[6], f[4], f[5], f[9]))
    return end, is64, secs


def _cstr(data, off):
    return data[off:data.index(b"\0", off)].decode("utf-8", "replace")


def elf_needed_py(path):
    """DT_NEEDED entries of the dynamic section (SHT_DYNAMIC, strings in its sh_link section)."""
    data = open(path, "rb").read()
    end, is64, secs = _elf_sections(data)
    out = []
    for typ, link, off, size, _ in secs:
        if typ != 6:   # SHT_DYNAMIC
            continue
        stroff = secs[link][2]
        fmt, step = (end + "qQ", 16) if is64 else (end + "iI", 8)
        for at in range(off, off + size, step):
            tag, val = struct.unpack_from(fmt, data, at)
            if tag == 0:   # DT_NULL
                break
            if tag == 1:   # DT_NEEDED
                out.append(_cstr(data, stroff + val))
    return out


def elf_undefined_py(path):
    """Names of the undefined (SHN_UNDEF) symbols of the dynamic symbol table (SHT_DYNSYM)."""
    data = open(path, "rb").read()
    end, is64, secs = _elf_sections(data)
    out = set()
    for typ, link, off, size, entsize in secs:
        if typ != 11:   # SHT_DYNSYM
            continue
        stroff = secs[link][2]
        entsize = entsize or (24 if is64 else 16)
        for at in range(off + entsize, off + size, entsize):   # entry 0 is the null symbol
            if is64:
                name, _info, _other, shndx = struct.unpack_from(end + "IBBH", data, at)
            else:
                name, = struct.unpack_from(end + "I", data, at)
                shndx, = struct.unpack_from(end + "H", data, at + 14)
            if shndx == 0 and name:
                out.add(_cstr(data, stroff + name))
    return out


# ---- the same through readelf ------------------------------------------------------------------

def elf_needed_readelf(readelf, path):
    out = subprocess.run([readelf, "-d", "-W", path], check=True, capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def elf_undefined_readelf(readelf, path):
    out = subprocess.run([readelf, "--dyn-syms", "-W", path], check=True, capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        f = line.split()
        # Num: Value Size Type Bind Vis Ndx Name
        if len(f) >= 8 and f[0].endswith(":") and f[6] == "UND":
            names.add(f[7].split("@")[0])
    return names


def transport_links(path):
    """(NEEDED entries, undefined symbols) of `path` that load or need NCCL or MPI, and the
    full NEEDED list and undefined set it was judged on (from readelf when it exists, checked
    against this file's own reader; else from the reader alone)."""
    needed, undef = elf_needed_py(path), {s.split("@")[0] for s in elf_undefined_py(path)}
    readelf = shutil.which("readelf")
    if readelf:
        r_needed, r_undef = elf_needed_readelf(readelf, path), elf_undefined_readelf(readelf, path)
        if sorted(r_needed) != sorted(needed) or r_undef != undef:
            raise AssertionError(f"{path}: readelf and the ELF reader disagree: NEEDED {r_needed} vs {needed}, "
                                 f"undefined symbols only in readelf's {sorted(r_undef - undef)[:10]}, "
                                 f"only in the reader's {sorted(undef - r_undef)[:10]}")
    bad_needed = [n for n in needed if FORBIDDEN_NEEDED.match(n)]
    bad_syms = sorted(s for s in undef if FORBIDDEN_SYMBOL.match(s))
    return bad_needed, bad_syms, needed, undef


def check_library(path):
    """An error message naming what links NCCL or MPI, or None."""
    bad_needed, bad_syms, needed, _ = transport_links(path)
    if not needed or not any(n.startswith("libc.") for n in needed):
        return f"{path}: no NEEDED libc.so found ({needed}): the ELF reading is broken"
    problems = []
    if bad_needed:
        problems.append(f"NEEDED {bad_needed}")
    if bad_syms:
        problems.append(f"undefined symbols {bad_syms[:20]}{' ...' if len(bad_syms) > 20 else ''}")
    if problems:
        return (f"{path} links a communication library ({'; '.join(problems)}): loading it would load "
                "NCCL or MPI ahead of torch's or the caller's; the EP transports must reach them "
                "only through src/cpu/ep_mpi_lib.c / src/cuda/ep_nccl_lib.c")
    return None


# ---- pytest: the installed package, in fresh interpreters --------------------------------------

# Imports moex first, records what is mapped, then torch and moex.torch, and runs a small
# GroupedLinear forward + backward on the CPU against a loop of F.linear. Prints one JSON line.
CHILD = r"""
import json, sys

def mapped():
    with open("/proc/self/maps") as f:
        return sorted({l.split()[-1] for l in f if len(l.split()) >= 6 and l.split()[-1].startswith("/")})

import moex
after_moex = mapped()
libmoex = [p for p in after_moex if "/libmoex.so" in p]
import torch
import moex.torch as mt

torch.manual_seed(0)
G, K, N, splits = 4, 16, 8, [5, 0, 9, 4]
T = sum(splits) + 3                       # three rows past the splits' sum
m = mt.GroupedLinear(G, K, N, bias=True)
x = torch.randn(T, K, requires_grad=True)
dy = torch.randn(T, N)
y = m(x, splits)
(y[:sum(splits)] * dy[:sum(splits)]).sum().backward()

# the reference: a loop of F.linear over the groups, its own autograd
ws = [getattr(m, f"weight{g}").detach().clone().requires_grad_(True) for g in range(G)]
bs = [getattr(m, f"bias{g}").detach().clone().requires_grad_(True) for g in range(G)]
xr = x.detach().clone().requires_grad_(True)
outs, r = [], 0
for g, s in enumerate(splits):
    outs.append(torch.nn.functional.linear(xr[r:r + s], ws[g], bs[g]))
    r += s
yr = torch.cat(outs)
(yr * dy[:r]).sum().backward()

def err(a, b):
    return float((a - b).abs().max()) if a.numel() else 0.0

errs = {"y": err(y[:r].detach(), yr.detach()), "dx": err(x.grad[:r], xr.grad[:r]),
        "dw": max(err(getattr(m, f"weight{g}").grad, ws[g].grad) for g in range(G)),
        "db": max(err(getattr(m, f"bias{g}").grad, bs[g].grad) for g in range(G))}
print(json.dumps({"after_moex": after_moex, "libmoex": libmoex, "torch": torch.__version__, "errs": errs}))
"""


def _run_child(code):
    env = dict(os.environ)
    env.setdefault("MOEX_NUM_THREADS", "1")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, f"the child interpreter failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def _have_torch():
    import importlib.util
    return importlib.util.find_spec("torch") is not None


def _libmoex_of_package():
    """The libmoex.so that `import moex` maps, in a fresh interpreter (no torch there)."""
    out = _run_child("import json, moex\n"
                     "print(json.dumps(sorted({l.split()[-1] for l in open('/proc/self/maps') "
                     "if '/libmoex.so' in l})))")
    assert len(out) == 1, f"import moex mapped {len(out)} libmoex files: {out}"
    return out[0]


def test_import_moex_first_then_torch_runs_a_layer():
    import pytest
    if not _have_torch():
        pytest.skip("torch is not installed")
    out = _run_child(CHILD)
    assert out["libmoex"], "import moex mapped no libmoex.so"
    loaded = [p for p in out["after_moex"] if re.search(r"/lib(nccl|mpi|mpich|open-pal|open-rte)\b", p)]
    assert not loaded, f"import moex loaded a communication library: {loaded}"
    for what, e in out["errs"].items():
        assert e <= 1e-4, f"GroupedLinear after import moex, import torch: {what} is off by {e} (torch {out['torch']})"


def test_package_library_links_no_nccl_or_mpi():
    lib = _libmoex_of_package()
    problem = check_library(lib)
    assert problem is None, problem


def test_elf_reader_finds_what_readelf_finds():
    """The fallback reader is not vacuous: on libmoex it finds libc among the NEEDED entries and
    the C library's functions among the undefined symbols, as readelf does."""
    lib = _libmoex_of_package()
    needed, undef = elf_needed_py(lib), elf_undefined_py(lib)
    assert any(n.startswith("libc.") for n in needed), needed
    libc = {"free", "calloc", "memcpy", "memset", "pthread_create"}
    assert libc & {s.split("@")[0] for s in undef}, sorted(undef)[:20]
    readelf = shutil.which("readelf")
    if readelf:
        assert sorted(elf_needed_readelf(readelf, lib)) == sorted(needed)
        assert elf_undefined_readelf(readelf, lib) == {s.split("@")[0] for s in undef}


# moex_ep_create for one transport in a fresh interpreter (argv: backend, comm kind, the
# library pattern of /proc/self/maps), with a communicator it never reaches: reports the status,
# the message, and the communication libraries mapped before and after. Prints one JSON line.
EP_CHILD = r"""
import ctypes, json, re, sys
import moex
from moex import _capi as C

backend, kind, pattern = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def mapped():
    with open("/proc/self/maps") as f:
        return sorted({l.split()[-1] for l in f if re.search(pattern, l)})
lib = C.LIB
lib.moex_ep_create.restype = ctypes.c_int
lib.moex_ep_create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.POINTER(C.EpConfig)]
lib.moex_ep_destroy.argtypes = [ctypes.c_void_p]
ctx = ctypes.c_void_p()
if lib.moex_context_create(ctypes.byref(ctx), backend, 0) != 0:
    print(json.dumps({"no_context": lib.moex_last_error(None).decode()}))
    sys.exit(0)
comm = ctypes.c_uint64(0)   # MPI: never read (MPI is not initialised); NCCL: a NULL ncclComm_t
cfg = C.EpConfig(comm_kind=kind, comm=ctypes.addressof(comm), num_experts=2, topk=1, hidden=4, dtype=0,
                 max_tokens=4, max_recv_rows=8, transfer=0)
before = mapped()
ep = ctypes.c_void_p()
st = lib.moex_ep_create(ctypes.byref(ep), ctx, ctypes.byref(cfg))
msg = lib.moex_last_error(ctx).decode()
lib.moex_ep_destroy(ep)
print(json.dumps({"status": lib.moex_status_string(st).decode(), "message": msg, "before": before,
                  "after": mapped(), "ep": bool(ep.value)}))
"""

# (backend, comm kind, maps pattern, what the build lacks, the environment variable)
TRANSPORTS = {"mpi": (0, 0, r"/lib(mpi|mpich)\b", "has no MPI", "MOEX_EP_MPI_LIBRARY"),
              "nccl": (1, 1, r"/libnccl\b", "has no NCCL", "MOEX_EP_NCCL_LIBRARY")}


def _ep_create(transport, env_value=None):
    """The child's report, or pytest.skip when the package has no such transport or backend."""
    import pytest
    backend, kind, pattern, lacks, var = TRANSPORTS[transport]
    env = {k: v for k, v in os.environ.items() if k != var}
    if env_value is not None:
        env[var] = env_value
    p = subprocess.run([sys.executable, "-c", EP_CHILD, str(backend), str(kind), pattern], capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0, f"the child interpreter failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    out = json.loads(p.stdout.strip().splitlines()[-1])
    if "no_context" in out:
        pytest.skip(f"no {transport} backend here: {out['no_context']}")
    if lacks in out["message"]:
        pytest.skip(f"the package's libmoex was built without {transport}: {out['message']}")
    return out


def test_ep_create_opens_the_transport_library_then():
    """The transport's library is not mapped by `import moex`, and is after moex_ep_create
    (which then reaches the communicator checks: MPI not initialised, a NULL ncclComm_t)."""
    import pytest
    ran = []
    for transport, want in (("mpi", "is not initialised"), ("nccl", "NULL ncclComm_t")):
        try:
            out = _ep_create(transport)
        except pytest.skip.Exception:
            continue
        ran.append(transport)
        assert not out["before"], f"{transport}: mapped before moex_ep_create: {out['before']}"
        assert out["status"] == "MOEX_ERR_INVALID_ARG" and want in out["message"], out
        assert out["after"], f"{transport}: moex_ep_create loaded no library: {out}"
        assert not out["ep"]
    if not ran:
        pytest.skip("the package has neither EP transport (no MPI build, no GPU)")


def test_ep_create_without_the_library_is_unsupported_and_says_why():
    """A library that cannot be opened, or lacks the functions: MOEX_ERR_UNSUPPORTED naming the
    library and dlerror()'s text, nothing created."""
    import pytest
    ran = []
    for transport in ("mpi", "nccl"):
        var, first = TRANSPORTS[transport][4], "MPI_Initialized" if transport == "mpi" else "ncclGetVersion"
        try:
            missing = _ep_create(transport, "/nonexistent/dir/libnotthere.so.7")
        except pytest.skip.Exception:
            continue
        ran.append(transport)
        msg = missing["message"]
        assert missing["status"] == "MOEX_ERR_UNSUPPORTED", missing
        assert "/nonexistent/dir/libnotthere.so.7" in msg and var in msg, msg
        assert "cannot open shared object file" in msg, f"no dlerror() text: {msg}"
        assert not missing["after"] and not missing["ep"], missing
        # libc is loaded (RTLD_NOLOAD finds it) but is no MPI or NCCL
        wrong = _ep_create(transport, "libc.so.6")
        assert wrong["status"] == "MOEX_ERR_UNSUPPORTED", wrong
        assert "libc.so.6" in wrong["message"] and f"lacks {first}" in wrong["message"], wrong["message"]
    if not ran:
        pytest.skip("the package has neither EP transport (no MPI build, no GPU)")


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    failed = False
    for lib in argv[1:]:
        problem = check_library(lib)
        if problem:
            print(f"test_import_order: FAIL: {problem}")
            failed = True
        else:
            bad_needed, bad_syms, needed, undef = transport_links(lib)
            print(f"test_import_order: OK: {lib}: NEEDED {needed}; {len(undef)} undefined symbols, "
                  "none of NCCL or MPI")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
