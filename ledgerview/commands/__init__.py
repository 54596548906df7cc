"""The command groups of the ``ledgerview`` command line, one module each; ``register`` adds a group's
subcommands to the parser and sets ``run`` on each, a function from the parsed arguments to an exit status."""
