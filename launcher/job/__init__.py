"""Running a job: the attempt loop (`Job`), the running attempt (`Supervisor`), the phases in between."""
