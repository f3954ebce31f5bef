"""The command line: `stowage plan` read back in Python, its --emit outputs against the
frameworks' own argument parsers and configs, and the bench program's --help."""
