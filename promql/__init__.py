"""PromQL evaluator over the AST of TurboProm's own parser (promql/parser/), vectorized with numpy."""
