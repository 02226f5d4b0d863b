"""Turn the parts of an upload into a directory holding exactly the two PEFT files, and the
adapter's own chat template if it brought one (chat_template.jinja, or tokenizer_config.json's).

An upload is either the two files themselves or one .tar.gz/.tgz/.tar/.zip archive of
them (at its top level or inside one folder, as `tar czf a.tgz my-adapter/` makes).
Archives are read member by member and copied to fixed names; nothing is ever
extracted by the archive's own paths, and absolute paths, `..`, links and special
files are refused outright rather than skipped, so a crafted archive is reported as such.
"""
from __future__ import annotations

import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import BinaryIO, TypeVar

from loraloom.engine import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from loraloom.platform.registry.chat_templates import CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG_FILE, gather_chat_template
from loraloom.platform.registry.errors import UploadRejectedError

ADAPTER_FILES = (ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE)
# Files an upload may add: the adapter's own chat template (kept as chat_template.jinja).
TEMPLATE_FILES = (CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG_FILE)
MODEL_CARD_FILE = "README.md"  # PEFT's save_pretrained writes one beside the adapter; it is not needed
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar")
ZIP_SUFFIXES = (".zip",)
GIB = 1024**3
COPY_CHUNK_BYTES = 1024 * 1024
MemberT = TypeVar("MemberT", tarfile.TarInfo, zipfile.ZipInfo)


@dataclass(frozen=True)
class UploadLimits:
    max_total_bytes: int = 2 * GIB  # all files of one upload, after unpacking
    max_archive_members: int = 16  # entries of an archive, folders included
    # Why max_total_bytes is what it is, for the error: the server's setting, or the served base.
    limit_reason: str = "this server's limit"

    def for_base(self, largest_adapter_bytes: int, rank: int) -> "UploadLimits":
        """At most what a valid adapter for the served base can unpack to, so that an archive bomb
        is stopped there rather than at the server-wide limit (GBs of writes to refuse it)."""
        if largest_adapter_bytes >= self.max_total_bytes:
            return self
        return replace(self, max_total_bytes=largest_adapter_bytes,
                       limit_reason=f"the largest adapter the served base model takes at rank {rank}")


@dataclass(frozen=True)
class UploadedPart:
    filename: str  # as the client named it; only its last path component is used
    stream: BinaryIO


@dataclass(frozen=True)
class _ArchiveEntry:
    path: str  # inside the archive
    is_dir: bool
    size: int  # declared uncompressed size; enforced again while copying


def stage_adapter_files(parts: Sequence[UploadedPart], dest: Path, *, limits: UploadLimits) -> None:
    """Write adapter_config.json and adapter_model.safetensors (and chat_template.jinja, checked, if the
    upload has a template) into the empty directory `dest`."""
    if not parts:
        raise UploadRejectedError(
            f"files: nothing was uploaded; send {ADAPTER_CONFIG_FILE} and {ADAPTER_WEIGHTS_FILE} as parts named "
            "'files', or one .tar.gz or .zip archive of them"
        )
    names = [_basename(part.filename) for part in parts]
    archives = [name for name in names if _archive_kind(name) is not None]
    if archives and len(parts) > 1:
        raise UploadRejectedError(
            f"files: {archives[0]!r} is an archive, so it must be the only file uploaded; got {len(parts)} files"
        )
    budget = _Budget(limits)
    if archives:
        _stage_archive(parts[0].stream, names[0], dest, budget, limits)
    else:
        for name, part in zip(names, parts, strict=True):
            target = _target_name(name, f"file {name!r}")
            if target is not None:
                _copy_new(part.stream, dest / target, budget, f"file {name!r}")
    missing = [name for name in ADAPTER_FILES if not (dest / name).is_file()]
    if missing:
        raise UploadRejectedError(
            f"files: {missing[0]} is missing; a PEFT adapter needs {ADAPTER_CONFIG_FILE} and {ADAPTER_WEIGHTS_FILE}"
        )
    gather_chat_template(dest)


class _Budget:
    """Bytes still allowed for this upload, counted as they are written (declared sizes may lie)."""

    def __init__(self, limits: UploadLimits) -> None:
        self.max_total_bytes = limits.max_total_bytes
        self.reason = limits.limit_reason
        self.used = 0

    def take(self, size: int) -> None:
        self.used += size
        if self.used > self.max_total_bytes:
            raise UploadRejectedError(
                f"files: the upload is larger than {self.reason}, {self.max_total_bytes} bytes (after unpacking); "
                "check that these are the adapter's files"
            )


def _basename(filename: str) -> str:
    return filename.replace("\\", "/").rsplit("/", 1)[-1]


def _archive_kind(name: str) -> str | None:
    lowered = name.lower()
    if lowered.endswith(TAR_SUFFIXES):
        return "tar"
    if lowered.endswith(ZIP_SUFFIXES):
        return "zip"
    return None


def _target_name(name: str, where: str) -> str | None:
    """The adapter file `name` is, None for a file that is skipped, or a refusal naming it."""
    if name in ADAPTER_FILES or name in TEMPLATE_FILES:
        return name
    if name == MODEL_CARD_FILE:
        return None
    if name.lower().endswith(PICKLE_SUFFIXES):
        raise UploadRejectedError(
            f"files: {where} is a pickle checkpoint, which is never accepted because unpickling runs code; "
            f"re-save the adapter with save_pretrained(safe_serialization=True) and upload {ADAPTER_WEIGHTS_FILE}"
        )
    raise UploadRejectedError(
        f"files: {where} is not part of a PEFT adapter; upload only {ADAPTER_CONFIG_FILE} and {ADAPTER_WEIGHTS_FILE} "
        f"(and the adapter's chat template, {CHAT_TEMPLATE_FILE} or {TOKENIZER_CONFIG_FILE}, if it has its own)"
    )


def _copy_new(source: BinaryIO, target: Path, budget: _Budget, where: str) -> None:
    if target.exists():
        raise UploadRejectedError(f"files: {where} duplicates {target.name}; upload each file once")
    with target.open("wb") as out:
        while chunk := source.read(COPY_CHUNK_BYTES):
            budget.take(len(chunk))
            out.write(chunk)


def _stage_archive(stream: BinaryIO, archive_name: str, dest: Path, budget: _Budget, limits: UploadLimits) -> None:
    kind = _archive_kind(archive_name)
    try:
        if kind == "tar":
            with tarfile.open(fileobj=stream, mode="r:*") as archive:
                members = _checked_members(_tar_entries(archive), archive_name, limits)
                for entry, member in members:
                    _stage_member(archive.extractfile(member), entry, archive_name, dest, budget)
        else:
            with zipfile.ZipFile(stream) as archive:
                members = _checked_members(_zip_entries(archive), archive_name, limits)
                for entry, info in members:
                    with archive.open(info) as source:
                        _stage_member(source, entry, archive_name, dest, budget)
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, OSError) as error:  # OSError: gzip's
        raise UploadRejectedError(f"files: {archive_name!r} is not a readable {kind} archive ({error})") from error


def _tar_entries(archive: tarfile.TarFile) -> Iterator[tuple[_ArchiveEntry, tarfile.TarInfo]]:
    for member in archive:  # read lazily: the member cap stops a huge listing early
        if member.issym() or member.islnk():
            raise _link_refused(member.name, member.linkname)
        if not (member.isfile() or member.isdir()):
            raise UploadRejectedError(
                f"files: archive entry {member.name!r} is a device, pipe or other special file; "
                "only regular files and folders are accepted"
            )
        yield _ArchiveEntry(path=member.name, is_dir=member.isdir(), size=member.size), member


def _zip_entries(archive: zipfile.ZipFile) -> Iterator[tuple[_ArchiveEntry, zipfile.ZipInfo]]:
    for info in archive.infolist():
        mode = info.external_attr >> 16  # the Unix mode, for archives made on Unix
        if stat.S_ISLNK(mode):
            raise _link_refused(info.filename, "")
        yield _ArchiveEntry(path=info.filename, is_dir=info.is_dir(), size=info.file_size), info


def _link_refused(name: str, target: str) -> UploadRejectedError:
    pointing = f" -> {target!r}" if target else ""
    return UploadRejectedError(
        f"files: archive entry {name!r}{pointing} is a link; links are not accepted, archive the files themselves"
    )


def _checked_members(
    entries: Iterator[tuple[_ArchiveEntry, MemberT]], archive_name: str, limits: UploadLimits
) -> list[tuple[_ArchiveEntry, MemberT]]:
    """All entries' paths and sizes checked before a single byte is unpacked; returns the files to copy."""
    files = []
    declared = 0
    folders: set[PurePosixPath] = set()
    for count, (entry, member) in enumerate(entries, start=1):
        if count > limits.max_archive_members:
            raise UploadRejectedError(
                f"files: {archive_name!r} holds more than {limits.max_archive_members} entries; "
                f"archive only {ADAPTER_CONFIG_FILE} and {ADAPTER_WEIGHTS_FILE}"
            )
        path = _safe_path(entry.path)
        if entry.is_dir:
            continue
        declared += entry.size
        if declared > limits.max_total_bytes:
            raise UploadRejectedError(
                f"files: {archive_name!r} unpacks to more than {limits.limit_reason}, {limits.max_total_bytes} bytes"
            )
        if len(path.parts) > 2:
            raise UploadRejectedError(
                f"files: archive entry {entry.path!r} is nested too deep; put the adapter files at the top of "
                "the archive or in one folder"
            )
        folders.add(path.parent)
        if _target_name(path.name, f"archive entry {entry.path!r}") is not None:
            files.append((entry, member))
    if len(folders) > 1:
        raise UploadRejectedError(
            f"files: {archive_name!r} spreads its files over several folders ({', '.join(sorted(map(str, folders)))}); "
            "put them in one"
        )
    return files


def _safe_path(name: str) -> PurePosixPath:
    normalized = name.replace("\\", "/")
    if normalized.startswith("/") or (len(normalized) > 1 and normalized[1] == ":"):
        raise UploadRejectedError(f"files: archive entry {name!r} has an absolute path; only relative paths are accepted")
    path = PurePosixPath(normalized)
    if ".." in path.parts:
        raise UploadRejectedError(f"files: archive entry {name!r} contains '..'; paths may not leave the archive")
    return PurePosixPath(*[part for part in path.parts if part != "."])


def _stage_member(source: BinaryIO | None, entry: _ArchiveEntry, archive_name: str, dest: Path, budget: _Budget) -> None:
    if source is None:
        raise UploadRejectedError(f"files: archive entry {entry.path!r} in {archive_name!r} cannot be read")
    _copy_new(source, dest / _safe_path(entry.path).name, budget, f"archive entry {entry.path!r}")

