"""`distrun check`: is every host ready for a launch."""
