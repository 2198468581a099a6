"""airflow-streambatch: heterogeneous batch inference on Spark, scheduled by Airflow."""

__version__ = "0.1.0"
