"""The command line: options and subcommands, the config file, the dry run."""
