"""fedfuse's digits quickstart as a Flower app."""
