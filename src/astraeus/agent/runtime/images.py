"""Image → local environment, for the process runtime: astraeus.imagemap (a bottom module, which
astraeus.settings checks ASTRAEUS_IMAGE_MAP with), under the runtime's name."""

from astraeus.imagemap import ImageMap, LocalEnvironment

__all__ = ["ImageMap", "LocalEnvironment"]
