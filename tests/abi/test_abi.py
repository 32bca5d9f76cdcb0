#!/usr/bin/env python3
"""test_abi.py - the ctypes mirrors of python/moex/_capi.py have the layout of include/moex.h
(with the headers it includes from its directory: the experimental moex_fp8.h and moex_ep.h,
read where moex.h includes them).

    python3 tests/abi/test_abi.py --layout ABI_LAYOUT --header include/moex.h \\
        --capi python/moex/_capi.py --lib LIBMOEX_SO --root REPO

ABI_LAYOUT is tests/abi/abi_layout.c built: the compiler's sizeof, alignof, and each field's
offsetof and sizeof, for every struct of the header. The test fails, naming the struct and
the field, when:
- a struct or field of the header is missing from abi_layout.c's list (the list is written by
  hand; the header's names are parsed here so that the list cannot fall behind);
- a struct of the header has no mirror in _capi.py: the mirror of moex_<name> is the class
  <Name> in CamelCase (moex_grouped_linear_args: GroupedLinearArgs), a ctypes.Structure; or a
  ctypes.Structure of _capi.py mirrors no struct of the header;
- a mirror lacks a field, has one more, orders them differently, puts a field at another
  offset or gives it another size, or differs in sizeof or alignment;
- a field is of another kind: a float where C has an integer, an integer where C has a
  pointer, another struct than the C field's (its mirror), an array where C has none;
- another Python file of the tree (bench/, tools/, examples/, tests/, scripts/, python/)
  defines a ctypes.Structure whose field names are those of a moex.h struct, or their
  beginning: a second copy, which falls behind when the header grows (bench/gemm_bench.py's
  copy without the fp8 field made the library read past the end of its structs). Scripts
  import moex._capi instead.

_capi.py is imported from the source tree (no install, no torch); importing it loads the
library, so --lib (the built libmoex.so) becomes its MOEX_LIBRARY.
"""
import argparse
import ast
import ctypes
import importlib.util
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "util"))
from moex_header import read_header  # noqa: E402

SCANNED_DIRS = ("bench", "tools", "examples", "tests", "scripts", "python")
INTEGER_TYPES = {"int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t",
                 "int", "unsigned", "size_t"}
FLOAT_TYPES = {"float", "double"}


# ---- the header: struct and field names, and each field's kind -----------------------------

def parse_header(path):
    """{struct: [(field, kind, element type, is array)]} in the header's order (its includes
    read in place); kind is 'pointer', 'integer' (enums too), 'float' or 'struct' (of the
    element for an array)."""
    text = read_header(path)
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    enums = set(re.findall(r"typedef\s+enum\s+\w*\s*\{[^}]*\}\s*(\w+)\s*;", text))
    structs = {}
    for name, body, alias in re.findall(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", text, flags=re.S):
        if alias != name:
            sys.exit(f"test_abi.py: typedef struct {name} {{...}} {alias}: the header names a struct and its "
                     "typedef alike; teach this parser otherwise")
        structs[name] = []
        for decl in filter(None, (d.strip() for d in body.split(";"))):
            m = re.match(r"(?:const\s+)?(\w+)\s*(.*)$", decl, flags=re.S)
            ctype, declarators = m.group(1), m.group(2)
            for d in declarators.split(","):
                fm = re.search(r"(\w+)\s*(\[\s*\w+\s*\])?\s*$", d)
                if not fm:
                    sys.exit(f"test_abi.py: cannot read the declaration `{decl}` of {name} in {path}")
                if "*" in d:
                    kind = "pointer"
                elif ctype in FLOAT_TYPES:
                    kind = "float"
                elif ctype in INTEGER_TYPES or ctype in enums:
                    kind = "integer"
                elif ctype in structs:
                    kind = "struct"
                else:
                    sys.exit(f"test_abi.py: {name}.{fm.group(1)} has the type {ctype}, of no kind this test "
                             "knows (pointer, integer, enum, float, a struct of the header)")
                structs[name].append((fm.group(1), kind, ctype, fm.group(2) is not None))
    return structs


# ---- the compiler's layout -------------------------------------------------------------------

def read_layout(program):
    """{struct: (sizeof, alignof, [(field, offsetof, sizeof)])} from abi_layout's output."""
    out = subprocess.run([program], check=True, capture_output=True, text=True).stdout
    layout = {}
    for line in out.splitlines():
        w = line.split()
        if w[0] == "struct":
            layout[w[1]] = (int(w[2]), int(w[3]), [])
        elif w[0] == "field":
            layout[w[1]][2].append((w[2], int(w[3]), int(w[4])))
    return layout


def check_list_covers_header(header, layout):
    """abi_layout.c's list has exactly the header's structs and fields, in order."""
    errors = [f"{s}: a struct of moex.h that tests/abi/abi_layout.c does not list (add STRUCT and FIELD lines)"
              for s in header if s not in layout]
    errors += [f"{s}: listed by tests/abi/abi_layout.c but not a struct of moex.h" for s in layout if s not in header]
    for s in header:
        if s in layout:
            want, got = [f[0] for f in header[s]], [f[0] for f in layout[s][2]]
            if want != got:
                errors.append(f"{s}: tests/abi/abi_layout.c lists the fields {got}, moex.h declares {want}")
    return errors


# ---- the mirrors -----------------------------------------------------------------------------

def mirror_name(struct):
    """moex_grouped_linear_args -> GroupedLinearArgs."""
    return "".join(w.capitalize() for w in struct[len("moex_"):].split("_"))


def load_capi(path, lib):
    os.environ["MOEX_LIBRARY"] = lib
    spec = importlib.util.spec_from_file_location("moex_capi_under_test", path)
    capi = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(capi)
    return capi


def ctypes_kind(t, mirror_of):
    """(kind, struct name or None, is array) of a ctypes field type."""
    if isinstance(t, type) and issubclass(t, ctypes.Array):
        kind, struct, _ = ctypes_kind(t._type_, mirror_of)
        return kind, struct, True
    if t in (ctypes.c_void_p, ctypes.c_char_p) or (isinstance(t, type) and issubclass(t, ctypes._Pointer)):
        return "pointer", None, False
    if t in (ctypes.c_float, ctypes.c_double):
        return "float", None, False
    if isinstance(getattr(t, "_type_", None), str) and t._type_ in "bBhHiIlLqQ":
        return "integer", None, False
    if t in mirror_of:
        return "struct", mirror_of[t], False
    return f"unknown ({getattr(t, '__name__', t)})", None, False


def compare(header, layout, capi, capi_path):
    errors = []
    mirrors = {s: getattr(capi, mirror_name(s), None) for s in header}
    mirror_of = {cls: s for s, cls in mirrors.items() if cls is not None}
    for s, cls in mirrors.items():
        if not (isinstance(cls, type) and issubclass(cls, ctypes.Structure)):
            errors.append(f"{s}: no mirror in {capi_path} (expected class {mirror_name(s)}(ctypes.Structure))")
    for name, obj in vars(capi).items():
        if isinstance(obj, type) and issubclass(obj, ctypes.Structure) and obj not in mirror_of:
            errors.append(f"{capi_path}: class {name} mirrors no struct of moex.h (the mirror of moex_<name> "
                          "is <Name> in CamelCase)")
    for s, cls in mirrors.items():
        if cls not in mirror_of:
            continue
        where = f"{s} ({mirror_name(s)})"
        size, align, fields = layout[s]
        py_fields = [f[0] for f in cls._fields_]
        c_fields = [f[0] for f in fields]
        for f in c_fields:
            if f not in py_fields:
                errors.append(f"{where}: field {f} missing from the mirror")
        for f in py_fields:
            if f not in c_fields:
                errors.append(f"{where}: the mirror has a field {f} that moex.h has not")
        if [f for f in py_fields if f in c_fields] != [f for f in c_fields if f in py_fields]:
            errors.append(f"{where}: fields in another order: mirror {py_fields}, moex.h {c_fields}")
        py_types = dict(cls._fields_)
        for (f, offset, fsize), (_, kind, ctype, is_array) in zip(fields, header[s]):
            if f not in py_types:
                continue
            d = getattr(cls, f)
            if d.offset != offset:
                errors.append(f"{where}.{f}: at offset {d.offset} in the mirror, {offset} in C")
            if d.size != fsize:
                errors.append(f"{where}.{f}: {d.size} bytes in the mirror, {fsize} in C")
            got_kind, got_struct, got_array = ctypes_kind(py_types[f], mirror_of)
            want = f"{'an array of ' if is_array else ''}{kind}{' ' + ctype if kind == 'struct' else ''}"
            got = f"{'an array of ' if got_array else ''}{got_kind}{' ' + got_struct if got_struct else ''}"
            if want != got:
                errors.append(f"{where}.{f}: {got} in the mirror, {want} in C ({ctype})")
        if ctypes.sizeof(cls) != size:
            errors.append(f"{where}: sizeof {ctypes.sizeof(cls)} in the mirror, {size} in C")
        if ctypes.alignment(cls) != align:
            errors.append(f"{where}: alignment {ctypes.alignment(cls)} in the mirror, {align} in C")
    return errors


# ---- second copies elsewhere in the tree -------------------------------------------------------

def structure_classes(path):
    """(line, class name, field names) of every class of the file with ctypes.Structure or
    ctypes.Union among its bases and a literal _fields_ list."""
    try:
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
    except (SyntaxError, UnicodeDecodeError):
        return []
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = {ast.unparse(b) for b in node.bases}
        if not bases & {"ctypes.Structure", "Structure", "ctypes.Union", "Union"}:
            continue
        for stmt in node.body:
            if (isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == "_fields_" for t in stmt.targets)
                    and isinstance(stmt.value, (ast.List, ast.Tuple))):
                names = [e.elts[0].value for e in stmt.value.elts
                         if isinstance(e, ast.Tuple) and e.elts and isinstance(e.elts[0], ast.Constant)]
                found.append((node.lineno, node.name, names))
    return found


def second_copies(root, header, capi_path):
    errors = []
    for top in SCANNED_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in ("__pycache__", "build")
                                 and not d.endswith(".egg-info"))
            for fn in sorted(filenames):
                path = os.path.join(dirpath, fn)
                if not fn.endswith(".py") or os.path.samefile(path, capi_path):
                    continue
                for line, cls, names in structure_classes(path):
                    for s, fields in header.items():
                        full = [f[0] for f in fields]
                        if len(names) >= 2 and full[:len(names)] == names:
                            errors.append(f"{os.path.relpath(path, root)}:{line}: class {cls} is a second copy of "
                                          f"{s}; use moex._capi.{mirror_name(s)}")
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layout", required=True, help="the built tests/abi/abi_layout.c")
    ap.add_argument("--header", required=True)
    ap.add_argument("--capi", required=True, help="python/moex/_capi.py")
    ap.add_argument("--lib", required=True, help="libmoex.so, which importing _capi.py loads")
    ap.add_argument("--root", required=True, help="the repository, searched for second copies")
    args = ap.parse_args()
    header = parse_header(args.header)
    layout = read_layout(args.layout)
    errors = check_list_covers_header(header, layout)
    if not errors:
        errors = compare(header, layout, load_capi(args.capi, args.lib), os.path.relpath(args.capi, args.root))
    errors += second_copies(args.root, header, args.capi)
    nfields = sum(len(f) for f in header.values())
    if errors:
        print(f"test_abi: {len(errors)} mismatches between include/moex.h and its ctypes mirrors:")
        for e in errors:
            print("  " + e)
        return 1
    print(f"test_abi: {len(header)} structs, {nfields} fields: every mirror in {os.path.relpath(args.capi, args.root)} "
          "has the C layout, and no other file copies one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
