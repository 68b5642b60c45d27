"""groklens.analyses: metrics over probed data and trajectories, comparisons, figures."""
