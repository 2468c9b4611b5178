"""Analysis of sweep studies: load, transform, plot, report (pandas and matplotlib live here)."""
