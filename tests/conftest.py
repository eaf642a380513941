"""Load the pagedkv Hypothesis profile: PAGEDKV_PROFILE, else `ci` under CI, else `dev`."""
from hypothesis import settings

from pagedkv.fuzz.profiles import default_profile

settings.load_profile(default_profile())
