"""Fitted and derived figures: the cost model, accept curves, predictions, comparisons."""
