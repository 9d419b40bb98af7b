"""Analysis over a session directory (pandas). Pure: reads a SessionReader, returns plain data."""
