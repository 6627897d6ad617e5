module example.com/svc
