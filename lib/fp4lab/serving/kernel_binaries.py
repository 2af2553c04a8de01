"""The GPU targets a kernel package's op libraries carry, read from the CUDA fat binaries in them.

An op library such as sgl_kernel's ``sm100/common_ops.abi3.so`` holds one fat binary per CUDA
compilation unit (ELF section ``.nv_fatbin``); each holds a cubin per ``sm_`` target and PTX per
``compute_`` target. fp4lab removes these libraries after install (they cannot load without CUDA:
``standins``), so their targets are read first, from the installed file; for an environment built
before fp4lab read them, from the same file in the wheel published on PyPI, fetched by HTTP range
and checked against the installed RECORD's sha256.
"""

from __future__ import annotations

import base64
import email
import hashlib
import importlib.metadata
import io
import json
import mmap
import platform
import struct
import urllib.request
import zipfile
from collections import Counter
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
CUBIN, PTX = 2, 1
OP_LIBRARIES = "common_ops."
"""The files whose targets are read: the op libraries sgl_kernel's loader chooses among (its
``_load_architecture_specific_ops``)."""
PYPI = "https://pypi.org/simple"
"""PyPI's simple index, asked for JSON (PEP 691): each file's name, URL and size."""
TIMEOUT_S = 120


def _section(elf: bytes | mmap.mmap, wanted: str) -> tuple[int, int] | None:
    """Offset and size of the ELF64 section named ``wanted``, or None."""
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    entsize, count, names_at = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * entsize) for i in range(count)]
    names = headers[names_at][4]
    for header in headers:
        end = elf.find(b"\0", names + header[0])
        if bytes(elf[names + header[0] : end]).decode() == wanted:
            return header[4], header[5]
    return None


def targets(elf: bytes | mmap.mmap) -> dict:
    """``{"units": n, "cubin": {"120": k, ...}, "ptx": {"90": k, ...}}``: the compilation units
    of an ELF op library and, per SM (10 x major + minor), how many carry a cubin or PTX for it."""
    found = _section(elf, ".nv_fatbin")
    if found is None:
        return {"units": 0, "cubin": {}, "ptx": {}}
    start, size = found
    units, cubin, ptx = 0, Counter(), Counter()
    at, end = start, start + size
    while (at := elf.find(struct.pack("<I", FATBIN_MAGIC), at, end)) >= 0:
        _, _, header, body = struct.unpack_from("<IHHQ", elf, at)
        entry, stop, kinds = at + header, at + header + body, {CUBIN: set(), PTX: set()}
        while entry < stop:
            kind, _, entry_header, padded = struct.unpack_from("<HHII", elf, entry)
            (sm,) = struct.unpack_from("<I", elf, entry + 28)
            kinds.get(kind, set()).add(sm)
            entry += entry_header + padded
        units += 1
        cubin.update(kinds[CUBIN])
        ptx.update(kinds[PTX])
        at = stop
    return {"units": units, "cubin": {str(k): n for k, n in sorted(cubin.items())},
            "ptx": {str(k): n for k, n in sorted(ptx.items())}}  # fmt: skip


def installed(path: Path) -> dict:
    """The targets of the op library at ``path`` (mapped, not read whole)."""
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as elf:
        return targets(elf)


def runs_on(found: dict, sm: tuple[int, int]) -> tuple[str | None, str]:
    """Whether an op library whose ``targets`` are ``found`` has code for ``sm``: True where every
    unit carries a cubin for exactly that SM, False where none carries a cubin of its major or
    PTX at or below it, else None (some units only, or code the GPU would have to JIT)."""
    want, units = sm[0] * 10 + sm[1], found["units"]
    exact = found["cubin"].get(str(want), 0)
    cubins = ", ".join(f"sm_{k}" for k in found["cubin"]) or "none"
    said = f"{exact} of its {units} compilation units carry an sm_{want} cubin (cubins: {cubins})"
    if units and exact == units:
        return True, said
    same_major = any(int(k) // 10 == sm[0] for k in found["cubin"])
    if units and not same_major and not any(int(k) <= want for k in found["ptx"]):
        return False, f"{said}; none holds PTX at or below compute_{want}"
    return None, said


def _record_hashes(dist_info: Path) -> dict[str, str]:
    rows = (line.split(",") for line in (dist_info / "RECORD").read_text().splitlines())
    return {row[0]: row[1].removeprefix("sha256=") for row in rows if len(row) > 2 and row[1]}


class _Ranged(io.RawIOBase):
    """A published file read by HTTP range requests, as a seekable file."""

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size, self.at = url, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.at

    def seek(self, offset: int, whence: int = 0) -> int:
        self.at = {0: offset, 1: self.at + offset, 2: self.size + offset}[whence]
        return self.at

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        count = min(len(buffer), self.size - self.at)
        if count <= 0:
            return 0
        asked = urllib.request.Request(
            self.url, headers={"Range": f"bytes={self.at}-{self.at + count - 1}"}
        )
        with urllib.request.urlopen(asked, timeout=TIMEOUT_S) as answer:
            data = answer.read()
        buffer[: len(data)] = data
        self.at += len(data)
        return len(data)


def wheel(project: str, version: str, built: frozenset[str] = frozenset({""})) -> dict:
    """The wheel PyPI publishes of ``project`` at ``version`` for this machine, its python-abi
    tag one of ``built`` (any where not told): its name, URL, size and hashes."""
    asked = urllib.request.Request(
        f"{PYPI}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(asked, timeout=TIMEOUT_S) as answer:
        files = json.load(answer)["files"]
    prefix, machine = f"{project.replace('-', '_')}-{version}-", f"{platform.machine()}.whl"
    found = next((f for f in files if f["filename"].startswith(prefix) and f["filename"].endswith(machine)
                  and any(f["filename"][len(prefix):].startswith(b) for b in built)), None)  # fmt: skip
    if found is None:
        raise LookupError(
            f"PyPI publishes no {project} {version} wheel for {', '.join(sorted(built))}{machine}"
        )
    return found


def published(dist_info: Path, members: list[str]) -> dict[str, dict]:
    """The targets of ``members`` (paths in site-packages) read from the wheel PyPI publishes for
    the distribution at ``dist_info``, each checked against the installed RECORD's sha256."""
    distribution = importlib.metadata.PathDistribution(dist_info)
    name, version = distribution.metadata["Name"], distribution.version
    tags = email.message_from_string(distribution.read_text("WHEEL") or "").get_all("Tag") or []
    # the python-abi part of each tag: the platform tag the installed WHEEL names is not the
    # published one's
    built = frozenset(tag.rsplit("-", 1)[0] + "-" for tag in tags)
    found_wheel = wheel(name.lower().replace("_", "-"), version, built)
    hashes, found = _record_hashes(dist_info), {}
    reader = io.BufferedReader(_Ranged(found_wheel["url"], found_wheel["size"]), 8 << 20)
    with zipfile.ZipFile(reader) as archive:
        for member in members:
            data = archive.read(member)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            if digest != hashes.get(member):
                raise ValueError(
                    f"{member} in {found_wheel['filename']} differs from the installed RECORD"
                )
            found[member] = targets(data) | {"read_from": found_wheel["filename"]}
    return found
