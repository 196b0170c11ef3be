"""Studies built on the mechanisms and the engine, each a folder with its model, chart and command-line verb."""
