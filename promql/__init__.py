"""PromQL evaluator over the AST of the ``promql-parser`` package, vectorized with numpy."""
