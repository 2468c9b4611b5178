"""Reports: what a report says (a Document plus figures) and the only writer of files."""
