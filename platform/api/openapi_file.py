"""`python -m loraloom.platform.api.openapi_file [FILE]`: the OpenAPI document of api_app() (the routes
alone: no engine, database or server), to FILE or standard output, as `make web-types` commits it."""
from __future__ import annotations

import sys
from pathlib import Path

from loraloom.platform.api.app import api_app
from loraloom.platform.api.openapi import document_text


def main(argv: list[str]) -> None:
    text = document_text(api_app().openapi())
    if argv:
        Path(argv[0]).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main(sys.argv[1:])
