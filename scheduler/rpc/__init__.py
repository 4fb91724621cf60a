"""The one HTTP kit for Spur's internal APIs (the controller's and the agent's), and for
the clients of the web API.

- `errors`: one error family for both halves (`Refused`, `Unauthorized`, `NotFound`,
  `Conflict`, `Unavailable`), each with its HTTP status; the body of an error is
  `{"detail": message, "code": code}`, the web API's shape.
- `server`: a Starlette app whose routes check the cluster token, read bounded JSON
  bodies, and answer raised errors (the core's `InvalidSpec` and `Rejected` included)
  with their status.
- `client`: failover across replicas, retries while they are unavailable, and the
  status of an answer turned back into the same errors.
- `http`: the wire of every client, the services' and the CLI's: HTTP/1.1 over a
  kept-alive socket, without `http.client` (its cost at start-up and per answer).
"""
