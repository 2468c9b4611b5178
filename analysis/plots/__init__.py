"""Figures: each ``plot_*`` draws computed frames or values into an Axes and never saves."""
