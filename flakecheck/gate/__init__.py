"""`flakecheck gate`: a CI regression gate over a run directory, its JUnit XML and markdown."""
