"""The model planner: a model as a stack of layer kinds, its cache and cost at a context, timed here."""
