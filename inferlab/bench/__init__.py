"""`inferlab bench`: a load tester for any OpenAI-compatible server.

A client only: it talks HTTP and never imports the engine, the models or torch.

The path of a run, top to bottom:

  cli.py            flags -> BenchConfig (config.py), then session.run_benchmark
  session.py        workload, worker pool, stages, /metrics scraping, self-calibration
  workload.py       --data -> request templates (synthetic.py, datasets.py, templates.py)
  sweep.py          fixed profiles, the sweep and the SLO search (pure logic in profiles.py)
  runner.py         one stage: split over workers (pool.py), collect, stop early
  worker.py         a process with one event loop: sends on schedule (client.py, httpstream.py)
  records.py        raw exchanges -> request records (parsed off the timing path)
  metrics.py        per-request metrics and their definitions
  summary.py        a stage's aggregates; timeline.py: the run over time
  report_*.py       JSON, CSV, HTML (svg.py, html_page.py); console.py; compare*.py
  mock.py           the mock OpenAI server (mock_process.py runs it in a child process)
"""
