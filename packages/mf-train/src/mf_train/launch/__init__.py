"""The `mf-train` command: its flags, subcommands, the rank processes it starts, restarts,
stop signals and the lines a run ends with. Nothing below imports it."""
