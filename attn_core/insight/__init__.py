"""What the numbers mean: the accuracy an approximation gives up, the attention each mechanism applies (effective),
cost at scale (theory), figures published elsewhere, and one layer step by step (lesson)."""
