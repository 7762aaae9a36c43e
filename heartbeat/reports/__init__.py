"""What is read back: the brief, the report, the seams, the edge profile."""
