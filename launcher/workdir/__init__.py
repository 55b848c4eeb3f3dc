"""`--workdir`: which files travel, and the sync that brings them to every host."""
