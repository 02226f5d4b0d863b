"""Turning an upload's parts into the two PEFT files: plain files, .tar.gz and .zip, and every
archive trick refused with a message naming it, before anything is written outside `dest`."""
from __future__ import annotations

import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest
from archives import tar_gz, zip_bytes

from loraloom.platform.registry.errors import UploadRejectedError
from loraloom.platform.registry.staging import COPY_CHUNK_BYTES, UploadedPart, UploadLimits, stage_adapter_files

CONFIG = b'{"peft_type": "LORA", "r": 4, "lora_alpha": 8}'
WEIGHTS = os.urandom(3000)
FILES = {"adapter_config.json": CONFIG, "adapter_model.safetensors": WEIGHTS}
LIMITS = UploadLimits(max_total_bytes=10_000, max_archive_members=5)


def tar_folder(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name.rstrip("/") or ".")
    info.type = tarfile.DIRTYPE
    return info


def stage(tmp_path: Path, parts: list[tuple[str, bytes]], limits: UploadLimits = LIMITS) -> Path:
    dest = tmp_path / "staged"
    dest.mkdir()
    stage_adapter_files([UploadedPart(name, io.BytesIO(data)) for name, data in parts], dest, limits=limits)
    return dest


def refused(tmp_path: Path, parts: list[tuple[str, bytes]], match: str, limits: UploadLimits = LIMITS) -> None:
    with pytest.raises(UploadRejectedError, match=match) as raised:
        stage(tmp_path, parts, limits)
    assert str(raised.value).startswith("files: ")
    escaped = [p for p in tmp_path.rglob("*") if p.is_file() and tmp_path / "staged" not in p.parents]
    assert escaped == [], "nothing may be written outside the staging directory"


def staged_files(dest: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dest.iterdir())}


def test_two_plain_files_are_staged_by_their_names(tmp_path):
    assert staged_files(stage(tmp_path, list(FILES.items()))) == FILES


def test_client_paths_in_part_names_are_ignored(tmp_path):
    dest = stage(tmp_path, [("../../adapter_config.json", CONFIG), ("C:\\x\\adapter_model.safetensors", WEIGHTS)])
    assert staged_files(dest) == FILES


@pytest.mark.parametrize("folder", ["", "my-adapter/", "./"])
def test_tar_gz_at_top_level_or_in_one_folder(tmp_path, folder):
    entries = [tar_folder(folder)] + [(folder + name, data) for name, data in FILES.items()]
    assert staged_files(stage(tmp_path, [("adapter.tar.gz", tar_gz(entries))])) == FILES


@pytest.mark.parametrize("folder", ["", "my-adapter/"])
def test_zip_at_top_level_or_in_one_folder(tmp_path, folder):
    entries = [(folder + name, data) for name, data in FILES.items()] + [(folder + "README.md", b"# card")]
    assert staged_files(stage(tmp_path, [("adapter.zip", zip_bytes(entries))])) == FILES


def test_model_card_beside_the_files_is_skipped(tmp_path):
    assert staged_files(stage(tmp_path, [*FILES.items(), ("README.md", b"# PEFT card")])) == FILES


@pytest.mark.parametrize(
    "name, match",
    [
        ("/etc/adapter_config.json", "absolute path"),
        ("../adapter_config.json", r"contains '\.\.'"),
        ("a/../../adapter_config.json", r"contains '\.\.'"),
    ],
)
@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_archive_path_attacks_are_refused(tmp_path, kind, name, match):
    entries = [(name, CONFIG), ("adapter_model.safetensors", WEIGHTS)]
    if kind == "tar":
        refused(tmp_path, [("a.tar.gz", tar_gz(entries))], match)
    else:
        info = zipfile.ZipInfo("placeholder")
        info.filename = name  # ZipInfo would normalize the path away; an attacker's archive does not
        refused(tmp_path, [("a.zip", zip_bytes([(info, CONFIG), ("adapter_model.safetensors", WEIGHTS)]))], match)


@pytest.mark.parametrize("link_type", [tarfile.SYMTYPE, tarfile.LNKTYPE])
def test_tar_links_are_refused(tmp_path, link_type):
    link = tarfile.TarInfo("adapter_model.safetensors")
    link.type = link_type
    link.linkname = "/etc/passwd"
    refused(tmp_path, [("a.tgz", tar_gz([("adapter_config.json", CONFIG), link]))], "is a link")


def test_zip_symlink_is_refused(tmp_path):
    link = zipfile.ZipInfo("adapter_model.safetensors")
    link.external_attr = (0o120777 << 16)  # a Unix symlink, as `zip --symlinks` stores it
    refused(tmp_path, [("a.zip", zip_bytes([("adapter_config.json", CONFIG), (link, b"/etc/passwd")]))], "is a link")


def test_tar_special_files_are_refused(tmp_path):
    fifo = tarfile.TarInfo("adapter_model.safetensors")
    fifo.type = tarfile.FIFOTYPE
    refused(tmp_path, [("a.tar.gz", tar_gz([("adapter_config.json", CONFIG), fifo]))], "special file")


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_too_many_archive_entries_are_refused(tmp_path, kind):
    folders = [f"empty-{i}/" for i in range(LIMITS.max_archive_members)]
    if kind == "tar":
        archive = tar_gz([*FILES.items(), *(tar_folder(name) for name in folders)])
    else:
        archive = zip_bytes([*FILES.items(), *((name, b"") for name in folders)])
    refused(tmp_path, [(f"a.{'tgz' if kind == 'tar' else 'zip'}", archive)], "more than 5 entries")


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_archive_unpacking_past_the_size_limit_is_refused(tmp_path, kind):
    # Highly compressible: a small archive that unpacks to 20x the limit (a decompression bomb).
    big = b"\0" * (LIMITS.max_total_bytes * 20)
    entries = [("adapter_config.json", CONFIG), ("adapter_model.safetensors", big)]
    archive = tar_gz(entries) if kind == "tar" else zip_bytes(entries)
    assert len(archive) < LIMITS.max_total_bytes
    refused(tmp_path, [(f"a.{'tar.gz' if kind == 'tar' else 'zip'}", archive)], "this server's limit, 10000 bytes")


def test_zip_lying_about_its_sizes_is_refused(tmp_path):
    archive = bytearray(zip_bytes([("adapter_config.json", CONFIG), ("adapter_model.safetensors", b"\0" * 50_000)]))
    # Patch the central directory's uncompressed size of the big member to 10 bytes.
    central = archive.rfind(b"PK\x01\x02")
    archive[central + 24 : central + 28] = (10).to_bytes(4, "little")
    refused(tmp_path, [("a.zip", bytes(archive))], "not a readable zip archive.*Bad CRC")


def test_plain_files_past_the_size_limit_are_refused(tmp_path):
    refused(tmp_path, [("adapter_config.json", CONFIG), ("adapter_model.safetensors", b"w" * 20_000)], "this server's limit, 10000 bytes")


@pytest.mark.parametrize("name", ["adapter_model.bin", "adapter_model.pt", "weights.pkl"])
def test_pickle_files_are_refused_even_beside_safetensors(tmp_path, name):
    refused(tmp_path, [*FILES.items(), (name, b"\x80\x04pickle")], "pickle checkpoint")


def test_pickle_inside_an_archive_is_refused(tmp_path):
    archive = tar_gz([("adapter_config.json", CONFIG), ("adapter_model.bin", b"\x80\x04")])
    refused(tmp_path, [("a.tar.gz", archive)], "adapter_model.bin.*pickle")


@pytest.mark.parametrize(
    "parts, match",
    [
        ([], "nothing was uploaded"),
        ([("adapter_config.json", CONFIG)], "adapter_model.safetensors is missing"),
        ([*FILES.items(), ("train.py", b"print()")], "'train.py' is not part of a PEFT adapter"),
        ([("adapter_config.json", CONFIG), ("adapter_config.json", CONFIG)], "duplicates adapter_config.json"),
        ([("a.zip", b"PK junk"), ("adapter_config.json", CONFIG)], "must be the only file"),
        ([("a.zip", b"not a zip at all")], "not a readable zip archive"),
        ([("a.tar.gz", b"not a tarball")], "not a readable tar archive"),
    ],
)
def test_wrong_file_sets_are_refused(tmp_path, parts, match):
    refused(tmp_path, parts, match)


def test_archive_spread_over_two_folders_is_refused(tmp_path):
    archive = tar_gz([("a/adapter_config.json", CONFIG), ("b/adapter_model.safetensors", WEIGHTS)])
    refused(tmp_path, [("x.tar.gz", archive)], "several folders")


def test_archive_nested_too_deep_is_refused(tmp_path):
    archive = zip_bytes([("a/b/adapter_config.json", CONFIG), ("a/b/adapter_model.safetensors", WEIGHTS)])
    refused(tmp_path, [("x.zip", archive)], "nested too deep")


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_archive_bomb_under_the_server_limit_stops_at_the_largest_adapter_of_the_base(tmp_path, kind):
    """Issue 12 item 13: a bomb under the server-wide limit (2 GiB by default) was written out in full
    before being refused. With the served base's cap, writing stops one chunk past that cap."""
    cap = 3 * COPY_CHUNK_BYTES
    limits = UploadLimits(max_total_bytes=10**12).for_base(cap, rank=8)
    bomb = b"\0" * (cap * 8)
    entries = [("adapter_config.json", CONFIG), ("adapter_model.safetensors", bomb)]
    archive = tar_gz(entries) if kind == "tar" else zip_bytes(entries)
    with pytest.raises(UploadRejectedError, match="largest adapter the served base model takes at rank 8") as raised:
        stage(tmp_path, [(f"a.{'tar.gz' if kind == 'tar' else 'zip'}", archive)], limits)
    assert str(cap) in str(raised.value)
    written = sum(p.stat().st_size for p in (tmp_path / "staged").rglob("*") if p.is_file())
    assert written <= cap + COPY_CHUNK_BYTES


def test_the_base_cap_never_raises_the_server_limit():
    assert LIMITS.for_base(LIMITS.max_total_bytes * 10, rank=64) == LIMITS
