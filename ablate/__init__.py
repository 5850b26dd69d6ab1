"""The ``ablate`` command line, on top of running (``ablations``) and comparing (``dashboards``).

It only parses, calls and prints: ``ablate.main.COMMANDS`` is the one table from command to function, and
``ablate.exits`` holds the exit codes. Heavy libraries are imported inside the commands, so ``ablate --help``
answers at once.
"""
