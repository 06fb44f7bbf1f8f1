"""Planning a compile: the source model's facts and the pins, read and checked before any work starts."""
