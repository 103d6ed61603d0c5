"""Detector rules and convergence predictors (replayed over stored runs)."""
