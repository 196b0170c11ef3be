"""Charts as pure functions of measured or computed frames: the house style, the Benchmark page's scaling charts,
the insight pages' charts, and export to PNG, SVG and HTML."""
