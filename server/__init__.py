"""An OpenAI-compatible HTTP server embedding the runtime (`jacobi-rt serve`; needs the [serve] extra).

settings  ServerSettings: model id, workers, queue, timeouts, body limit, API key, hosts, docs
bodies    read_json: Content-Type, size, JSON, depth and lone surrogates checked (4xx)
hosts     HostCheck: the Host header must be the address connected to (DNS rebinding)
schemas   request bodies -> GenerationCall (pydantic), fields that would change the output refused
replies   response objects and server-sent-event chunks in OpenAI's format
pool      WorkerPool (places taken on arrival, bounded threads + queue) and Job (one cancellable generation)
metrics   prometheus_client metrics (vLLM's names where they exist) and the request-counting middleware
errors    APIError: OpenAI's error object with an HTTP status
app       create_app(generator, settings): the FastAPI app
run       serve() (uvicorn, graceful shutdown) and BackgroundServer (a loopback server in a thread)
"""
