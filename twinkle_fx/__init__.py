"""twinkle_fx."""
