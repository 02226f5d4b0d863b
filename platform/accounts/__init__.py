"""Accounts: tenants (tenants.py) and their API keys, with the Caller a key makes a request act
as (keys.py). Plain services on the database; the HTTP side (bearer parsing, roles) is api/."""
