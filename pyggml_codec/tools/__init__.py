"""Tools over the codec: comparing runs (``compare``), timing backends (``bench``), and the
random-weight demo model (``demo``)."""
