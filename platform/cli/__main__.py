"""`python -m loraloom.platform.cli ...`: how `serve` starts its training worker (see serve.py)."""
from loraloom.platform.cli.main import main

main()
