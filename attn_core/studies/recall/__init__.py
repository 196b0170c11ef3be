"""Associative recall (MQAR): what a mechanism's speed costs in what a tiny trained model can recall."""
