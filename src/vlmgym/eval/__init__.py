"""Evaluation: geolocation and nlvr2 metrics with bootstrap intervals, and the reports built from them."""
