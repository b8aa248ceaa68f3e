"""An OpenAI-compatible HTTP server embedding the runtime (`jacobi-rt serve`; needs the [serve] extra).

    settings  ServerSettings: model id, workers, queue, timeouts, body limit, API key
    schemas   request bodies -> GenerationCall (pydantic), unsupported fields refused
    replies   response objects and server-sent-event chunks in OpenAI's format
    pool      WorkerPool (bounded threads + bounded queue) and Job (one cancellable generation)
    metrics   Prometheus text exposition and the request-counting middleware
    errors    APIError: OpenAI's error object with an HTTP status
    app       create_app(generator, settings): the FastAPI app
    run       serve() (uvicorn, graceful shutdown) and BackgroundServer (a loopback server in a thread)
"""
