"""One module per ``dstk`` subcommand; see ``dstk.cli`` for the protocol."""
