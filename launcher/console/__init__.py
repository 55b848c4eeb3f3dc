"""distrun's own output: the byte relay of the ranks' streams, redraws, the progress line."""
