"""A plain numpy MLP on Flower, for fedfuse's tests and benchmark."""
