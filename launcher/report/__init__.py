"""What happened: the end-of-run account, the summary, the report file, the start-up timeline."""
