"""What chat and text completions share, one concern a module: which adapter a request names
(`adapters`), the engine's sampling parameters (`sampling`), one engine request per choice and their
outputs merged (`choices`), a whole answer and its usage (`collect`), server-sent events and client
disconnects (`streaming`), and a generation from plan to answer (`respond`)."""
