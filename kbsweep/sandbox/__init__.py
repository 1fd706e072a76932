"""Confinement: commands and grading processes under bubblewrap, their only ways out (relays, allow-proxy), what they use (memory, disk). Imports: records, config."""
