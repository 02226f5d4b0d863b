"""The `loraloom` command line.

main.py is the grammar and the dispatch; each other module is one group of commands:
serve.py (the server and training worker processes), admin.py (straight on the database),
and over HTTP against a running server, through http_client.py: keys.py, adapters.py,
training.py (files and jobs). The HTTP command modules import http_client and nothing of
each other."""
