"""A .tar.gz written as it is sent: a version's files go out as an archive without ever being
held in memory or written to disk whole.

`tarfile` writes a member only as one blocking call that reads its whole source, which a
generator cannot interleave with sending; the format is simple enough to write here instead:
per member a header block and the content padded to 512 bytes, then two zero blocks, all
through one gzip compressor.
"""
from __future__ import annotations

import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from loraloom.platform.storage import read_chunks

BLOCK = tarfile.BLOCKSIZE  # 512
# Adapter weights are near-random floats that barely compress: the fastest level keeps the
# server's CPU for inference, at a few percent more bytes.
GZIP_LEVEL = 1
GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer around the deflate stream


@dataclass(frozen=True)
class ArchiveMember:
    name: str
    size: int  # bytes `stream` holds; the header is written before they are read
    stream: BinaryIO  # closed once written
    mtime: float  # seconds since the epoch


def tar_gz(members: list[ArchiveMember]) -> Iterator[bytes]:
    """The gzip-compressed tar of `members` (regular files, mode 0644, at the archive's top), in
    chunks. Every stream is closed at the end, also when the consumer stops early. A stream that
    holds another size than declared raises: the archive would be corrupt."""
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, GZIP_WBITS)
    try:
        for member in members:
            yield compressor.compress(_header(member))
            written = 0
            for chunk in read_chunks(member.stream):
                written += len(chunk)
                if written > member.size:
                    break
                yield compressor.compress(chunk)
            if written != member.size:
                raise ValueError(f"{member.name}: the stored file holds {written} bytes, not the {member.size} listed")
            yield compressor.compress(b"\0" * (-member.size % BLOCK))
        yield compressor.compress(b"\0" * (2 * BLOCK))  # end of archive
        yield compressor.flush()
    finally:
        for member in members:
            member.stream.close()


def _header(member: ArchiveMember) -> bytes:
    info = tarfile.TarInfo(member.name)
    info.size = member.size
    info.mtime = int(member.mtime)
    info.mode = 0o644
    # PAX: any size, where the classic ustar header stops at 8 GiB.
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
