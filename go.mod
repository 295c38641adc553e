module github.com/edgelimit/edgelimit

go 1.26
