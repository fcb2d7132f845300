"""The code the algorithm files share, as the design names it: an env, model loading and sampling,
and a KL/advantage utility module, plus the run's plumbing. Four packages, each importing only from
those below it (env < models < rl < run); each package's face (its __init__) names what an
algorithm file may import, and tests/test_layers.py holds every file to those four."""
