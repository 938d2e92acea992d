"""The app's runtime, beside `app.py` (which builds the page from `layout` and wires its events).

    models     the loaded pair (one at a time, shared): load, background preload, warm-up, status,
               and per-run views of the pair with the route that run asked for
    loading    a load in steps a person follows (unpacking, the kernel, measuring): one bar that only rises
    sessions   one cancellation scheme per visitor: tickets for runs, sweeps and route searches
    inputs     settings from the page, checked, as engine objects (or a UserError to show)
    runs       Run: VIA-SD, plain SD and AR streamed; fidelity afterwards
    api        the JSON endpoints for scripts and MCP: a comparison's numbers and traces, the what-if
    views      what follows a run or an upload: figures, trace table and files, learn view, race
    recorded   the real run the page opens on (assets/recorded/), shown before any model has loaded
    lab        the threshold lab (what-if estimate, measured sweep) and the route search
    costs      "Why this speed" and "Where it would pay" (the engine's cost model, drawn by viz)
    layout     the page's components in reading order, one builder per area (no events)
    downloads  this process's temp folder for download files, one sub-folder per session
    gpu        the ZeroGPU window (`spaces.GPU`) and how long a run may hold it
"""
